"""
The cluster's lane serving: validated by vLLM (on the controller, then in the image), one unit per
node (rank 0 serves the API, the others run headless), no other lane running, ready and warm.

    pyinfra inventory/pair.py deploys/lane.py            # lane = "..." in group_data, or --data lane=...
"""

from sparkinfra import lane_steps, run

here = run.start()  # once per run: settings checked, SSH tuned, the converge lock held
plan = lane_steps.placed(here)  # every node: files, unit, no other lane; validated by vLLM on the head
if plan and here.is_head:
    lane_steps.serving_from_head(here, plan)  # every rank started (workers first), ready, warm
