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


def test_a_ui_asset_nobody_serves_is_a_404_logged_nowhere(tmp_path, caplog):
    """Dash's own error for an unknown asset path was no HTTP error: a 500 and a 3.8 KB traceback in the log for
    every such request, with no token needed."""
    daemon = Daemon(config=parse({"state_dir": str(tmp_path)}, env={}), clock=WallClock(1.0))
    client = create_app(daemon).test_client()
    for path in ("/_dash-component-suites/dash/x5.js", "/_dash-component-suites/dash/..%2f..%2fsetup.py"):
        r = client.get(path)
        assert r.status_code == 404 and r.get_json() == {"error": "no such UI asset"}, path
    assert not [rec for rec in caplog.records if rec.levelname == "ERROR"]


def test_an_unexpected_error_is_logged_on_one_line_whatever_its_path(tmp_path, caplog):
    """The path was logged as it came: a %0A in it wrote a line of the sender's choosing into the log."""
    _, app = _app(tmp_path)

    def boom(rest: str) -> str:
        raise RuntimeError("failed\nhere")

    app.add_url_rule("/boom/<rest>", "boom", boom)
    r = app.test_client().get("/boom/x%0A2026-12-02%2011:00:00,000%20CRITICAL%20sits_observe.auth:%20forged")
    assert r.status_code == 500
    (record,) = [rec for rec in caplog.records if rec.levelname == "ERROR"]
    assert "\n" not in record.getMessage() and "CRITICAL sits_observe.auth" in record.getMessage()
