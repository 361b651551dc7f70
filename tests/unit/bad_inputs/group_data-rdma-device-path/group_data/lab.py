cluster = "lab"
fabric_subnet = "10.0.0.0/24"
rdma_devices = ["rocep1s0f0", "../../../etc"]
