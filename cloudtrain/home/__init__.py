"""What cloudtrain keeps on this machine: the home folder, its errors, process records, each job's timeline, what
ended runs measured."""
