nccl_version = "2.29.7"
