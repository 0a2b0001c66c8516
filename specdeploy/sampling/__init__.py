"""How a measurement runs on a host, written once for the speculation gate (steps/gate.py) and every
measurement (measure/: compare, tune, the load tune and proof): the sampler (the lease renewed, the
benchmark started ahead, a fresh server, the warm-up), the one loop that runs a plan's samples in
order (`runs.run_samples`), the visits across load levels, and the gate's two plans. A plan says
which unit, in which order, on which workload; the verdicts are decide/'s.

It stands below steps/ so a step and the flows above both use it: the deploy lock's renewal is
handed in (steps/lock.LeaseRenewal), never imported from here."""
