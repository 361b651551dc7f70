cluster = "lab"
fabric_subnet = "10.0.0.0/24"
fabric_interface = "enp1s0f0np0abcde"
