"""
One image ID and one verified model snapshot on every node, moved head -> workers over the fabric:
the lane's image (built on the head from its recipe, or pulled by its locked digest), else the
cluster's; the snapshots at their locked commits, downloaded on the head in that image.

    pyinfra inventory/pair.py deploys/stage.py            # --data stage_verify=deep: sha256 of every file
"""

from pyinfra import inventory

from sparkinfra import lanes, run, transfer
from sparkinfra.operations.stage import (
    image_built,
    image_on_workers,
    image_present,
    snapshot_downloaded,
    snapshot_manifest,
    snapshot_matches,
    snapshot_served,
    snapshot_synced,
)

here = run.start()  # once per run: settings checked, SSH tuned, the converge lock held
cluster = here.cluster
config = cluster.config
workers = [(inventory.get_host(w.name), str(w.fabric_ip)) for w in cluster.workers]
deep = config.stage_verify == "deep"
lane = lanes.find_lane(config.lane) if config.lane else None
image = lanes.lane_image(lane, config.image, dict(cluster.pins)) if lane else lanes.Image(config.image)
# The site's image only where the lane needs it: as its image, or as its recipe's base.
site_image = image.ref == config.image or bool(image.recipe and image.recipe.base == config.image)

if here.is_head:
    if site_image:
        image_present(
            name=f"Image {config.image} is on the head",
            image=config.image,
            image_id=config.image_id,
            tarball=config.image_tarball,
            build=config.image_build,
        )
    if image.recipe:
        image_built(
            name=f"Image {image.ref} is built on the head from recipe images/{image.name}",
            image=image,
        )
    elif image.ref != config.image:
        image_present(
            name=f"Lane image {image.ref} is on the head",
            image=image.ref,
        )
    image_on_workers(
        name=f"Every worker has the head's {image.ref}",
        image=image.ref,
        workers=workers,
    )
head = inventory.get_host(cluster.head.name)
source = transfer.source(str(cluster.head.fabric_ip), config.stage_port)
for repo, revision in transfer.models(cluster):
    repo_dir = transfer.repo_dir(config.model_dir, repo)
    if here.is_head:
        snapshot_downloaded(
            name=f"Snapshot {repo}@{revision[:12]} is on the head",
            repo=repo,
            revision=revision,
            cache_dir=config.model_dir,
            image=image.ref,  # the lane's: every vLLM image has huggingface_hub
            token_env=config.hf_token_env,
            endpoint=config.hf_endpoint,
        )
    # Each node's record of its copy (the head's: what the workers pull); deep: every file hashed.
    snapshot_manifest(
        name=f"Manifest of {repo} is current on every node" + (", every file hashed" if deep else ""),
        repo_dir=repo_dir,
        deep=deep,
        required=here.is_head,
    )
    # On every node, each in turn (pyinfra orders an operation after those every node ran before it):
    # the head serves the snapshot while every worker whose copy differs pulls it, the head stops
    # serving, and each node's copy, the head's too, is checked (a mismatch names the files).
    snapshot_synced(
        name=f"Each worker's {repo} is pulled from the head where it differs (the head serves it meanwhile)",
        repo_dir=repo_dir,
        head=head,
        workers=workers,
        bind_ip=str(cluster.head.fabric_ip),
        port=config.stage_port,
        source=source,
        streams=config.stage_streams,
    )
    snapshot_served(
        name=f"The head no longer serves {repo}",
        repo_dir=repo_dir,
        head=head,
        present=False,
    )
    snapshot_matches(
        name=f"{repo} on every node matches the head's manifest",
        repo_dir=repo_dir,
        head=head,
    )
