_sudo = True
stage_stream = 4
