"""What Home Assistant reads to know a server and its models: a server id kept in data_dir (the
same at any address and after a restart) and each model's capabilities on /v1/queue."""

from __future__ import annotations

from hearth_server import HearthServer


def test_the_server_id_is_kept_across_restarts_and_differs_between_servers(tmp_path):
    with HearthServer(data_dir=tmp_path / "a") as a:
        first = a.get("/health")[1]["server_id"]
    assert (tmp_path / "a" / "server_id").read_text().strip() == first
    with HearthServer(data_dir=tmp_path / "a") as again:
        assert again.get("/health")[1]["server_id"] == first
        status, queue = again.get("/v1/queue")
    assert status == 200
    caps = next(iter(queue["models"].values()))["capabilities"]
    assert "tools" in caps and "vision" not in caps  # Hearth reads no images
    with HearthServer(data_dir=tmp_path / "b") as other:
        assert other.get("/health")[1]["server_id"] not in (first, None)
