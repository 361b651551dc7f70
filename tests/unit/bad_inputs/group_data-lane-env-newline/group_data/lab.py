cluster = "lab"
fabric_subnet = "10.0.0.0/24"
lane_env = {"VLLM_LOGGING_LEVEL": "INFO\nLD_PRELOAD=/tmp/x.so"}
