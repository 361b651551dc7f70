cluster = "lab"
