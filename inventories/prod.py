# Example production inventory: GPU hosts reached over SSH. The file name makes every host a member
# of the `prod` group (group_data/prod.py); `canary` is deployed first by a fleet rollout.
canary = [
    ("gpu-01.example.internal", {"ssh_user": "deploy", "_sudo": True}),
]
gpu_hosts = [
    ("gpu-02.example.internal", {"ssh_user": "deploy", "_sudo": True}),
    ("gpu-03.example.internal", {"ssh_user": "deploy", "_sudo": True}),
]
