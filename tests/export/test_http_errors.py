"""Error answers keep the headers their status requires: Allow on a 405 (RFC 9110), WWW-Authenticate on a 401
(RFC 6750), with the JSON body."""

from sits_observe.clock import WallClock
from sits_observe.config import parse
from sits_observe.daemon import Daemon
from sits_observe.export.http import create_app, require_token

TOKEN = "a-token-of-thirty-two-characters!"


def _app(tmp_path):
    daemon = Daemon(config=parse({"state_dir": str(tmp_path), "api_token": TOKEN}, env={}), clock=WallClock(1.0))
    return daemon, create_app(daemon, ui=False)


def test_a_method_not_allowed_names_the_allowed_ones(tmp_path):
    """The JSON error handler dropped the Allow header that Werkzeug's 405 carries."""
    _, app = _app(tmp_path)
    client = app.test_client()
    for path in ("/metrics", "/api/v1/stages", "/healthz"):
        r = client.post(path)
        assert r.status_code == 405 and r.get_json()["error"], path
        assert {m.strip() for m in r.headers.get("Allow", "").split(",")} >= {"GET", "HEAD"}, (path, r.headers)


def test_a_missing_token_names_the_bearer_scheme(tmp_path):
    daemon, app = _app(tmp_path)
    app.add_url_rule("/api/v1/mutate", "mutate", require_token(daemon)(lambda: "done"), methods=["POST"])
    client = app.test_client()
    r = client.post("/api/v1/mutate", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.get_json()["error"] == "missing or wrong bearer token"
    assert r.headers.get("WWW-Authenticate", "").startswith("Bearer ")
    ok = client.post("/api/v1/mutate", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and "WWW-Authenticate" not in ok.headers
