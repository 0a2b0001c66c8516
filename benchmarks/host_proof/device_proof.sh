#!/usr/bin/env bash
# The device calls of the H200 recording (README.md), run from the repo root on the H200 machine
# with `.gpu` carried. State lives in /tmp, which survives between calls only while it stays warm.
#   recv N    copy carried part N of the vLLM 0.26.0 pack (.gpu/pack) to /tmp/parts
#   prove     unpack the pack; make the machine a host as a deploy leaves it (the service user and
#             its home, the venv at cfg.venv seeing the unpacked vLLM, the HF cache with the
#             architectures' snapshots); run the product's proof command (render.py's command.sh)
#             with each rendered request on stdin; outputs to $OUT
set -uo pipefail
c=.gpu/host_proof
case "$1" in
  recv)
    mkdir -p /tmp/parts && cp .gpu/pack/vllm026.tar.xz.part-0"$2" /tmp/parts/ && ls -la /tmp/parts
    nvidia-smi --query-gpu=name,memory.used,driver_version --format=csv,noheader
    command -v runuser; python3 -c "import torch, tokenizers; print(torch.__version__)" ;;
  prove)
    for f in .gpu/pack/vllm026.tar.xz.part-*; do cp -n "$f" /tmp/parts/; done
    (cd /tmp/parts && sha256sum -c "$OLDPWD/.gpu/pack/SHA256SUMS") || exit 2
    if [ ! -d /tmp/site/vllm ]; then mkdir -p /tmp/site; t=$SECONDS
      cat /tmp/parts/vllm026.tar.xz.part-* | xz -dc -T0 | tar -C /tmp/site -x || exit 3
      echo "unpacked in $((SECONDS - t)) s"; fi
    chmod -R a+rX /tmp/site
    id vllm >/dev/null 2>&1 || useradd --system --home-dir /var/lib/specdeploy/cache vllm
    mkdir -p /var/lib/specdeploy/cache && chown vllm:vllm /var/lib/specdeploy/cache
    venv=/opt/specdeploy/venvs/vllm-0.26.0
    [ -x $venv/bin/python ] || python3 -m venv --system-site-packages $venv || exit 4
    # the venv sees the unpacked vLLM and the image's torch (found through the image's PYTHONPATH,
    # which the proof's empty environment does not have)
    { echo /tmp/site; python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))"; } \
      > "$($venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/specdeploy-pack.pth"
    PYTHONPATH=/tmp/site python3 $c/gpu_truth/make_weights.py /var/lib/specdeploy/hf || exit 5
    chgrp -R vllm /var/lib/specdeploy/hf && chmod -R g+rX,o-rwx /var/lib/specdeploy/hf
    $venv/bin/python -c "import importlib.metadata as m; print('vllm', m.version('vllm'))"
    nvidia-smi --query-gpu=name,memory.used,driver_version --format=csv,noheader | tee $OUT/gpu.txt
    for case in good bad; do
      t=$SECONDS
      bash -c "$(cat $c/command.sh)" < $c/$case.json > $OUT/$case.out 2> $OUT/$case.err
      echo "$case: exit $? in $((SECONDS - t)) s" | tee -a $OUT/exit.txt
      python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['ok'], r['stage'], r['error'], r['keys'])" $OUT/$case.out
    done ;;
esac
