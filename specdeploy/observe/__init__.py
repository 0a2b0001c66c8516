"""After the rollout: `specdeploy status`, its table, Prometheus and Grafana files."""
