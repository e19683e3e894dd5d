from cloudtrain.cli.main import entry

entry()
