"""What the platforms offer: machines and prices (the catalog) and the images nodes run."""
