"""Custom pyinfra facts: what is on a host right now, read without changing anything. One module
per tool that answers (nvidia.py: nvidia-smi and the NVIDIA driver; systemd.py; haproxy.py; vllm.py;
files.py; system.py: disk, memory and the CPU; http.py: curl), each fact with its one parser;
base.py holds the `Fact` base; cuda_boot.py the CudaBoot fact's value without pyinfra, which the
renderer takes. Import a fact from its module. Each fact's recorded outputs and values are
fixtures in tests/facts/<FactClassName>/, pyinfra style."""
