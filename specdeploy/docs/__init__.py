"""The manual's reference pages, generated from the code they describe: host data from the schema's
`Field(description=...)`, the commands from their argparse parsers, the release matrix from the
release tables (`python -m specdeploy.docs.reference` writes them under docs/reference/)."""
