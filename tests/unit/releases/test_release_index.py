"""The release tables cover every vLLM release PyPI listed (releases/index.json) from the oldest
specdeploy supports to the newest: a missing release or build is a red test, not a user's
"has no release table"."""

from packaging.version import Version

from specdeploy.releases import capabilities


def packaged() -> list[str]:
    return [
        v for v in capabilities.known_versions() if capabilities.table_source(v) == "specdeploy"
    ]


def test_no_release_between_the_oldest_and_the_newest_lacks_a_table():
    index = capabilities.release_index()
    oldest = Version(index["oldest_supported"])
    listed = [v for v in index["packages"]["vllm"] if Version(v) >= oldest]
    missing = sorted(set(listed) - set(packaged()), key=Version)
    assert not missing, f"no table for {missing}: specdeploy releases add VERSION, then commit it"
    assert packaged()[0] == index["oldest_supported"]
    assert packaged()[-1] == max(listed, key=Version)  # no table for a release PyPI never had


def test_every_build_pypi_has_is_in_its_table():
    index = capabilities.release_index()
    for package, versions in index["packages"].items():
        for version in versions:
            if Version(version) >= Version(index["oldest_supported"]):
                builds = capabilities.table(version)["builds"]
                assert package in builds, f"{version}: {package} wheel not read"


def test_each_table_names_the_wheel_it_was_read_from():
    for version in packaged():
        for package, facts in capabilities.table(version)["builds"].items():
            dist = package.replace("-", "_")
            assert facts["wheel"].startswith(f"{dist}-{version}-") and "sha256:" in facts["wheel"]
