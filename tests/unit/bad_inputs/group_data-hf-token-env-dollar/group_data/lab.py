cluster = "lab"
fabric_subnet = "10.0.0.0/24"
hf_token_env = "$HF_TOKEN"
