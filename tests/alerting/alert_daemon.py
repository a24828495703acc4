"""A daemon-like process for the fault test: queues alert state changes and delivers them.

    alert_daemon.py STATE_DIR URL SECRET first|restart

``first`` queues CHANGES, prints ``queued`` and delivers; ``restart`` re-announces the last state of
each alert (as a restarted evaluator does) and delivers what is pending.  Both exit 0 once the outbox
is empty.
"""

import sys
import time
from pathlib import Path

from sits_observe.alerting.config import AlertingConfig
from sits_observe.alerting.dispatch import Dispatcher
from sits_observe.alerting.formats import Alert

T = 1_700_000_000.0
# (slo, status, start): every one is a state change
CHANGES = [("a", "firing", T), ("b", "firing", T + 1), ("a", "resolved", T), ("c", "firing", T + 3),
           ("b", "resolved", T + 1), ("a", "firing", T + 5), ("c", "resolved", T + 3), ("a", "resolved", T + 5)]


def alert(slo: str, status: str, start: float) -> Alert:
    return Alert({"alertname": "SitsSloBurnRate", "slo": slo}, {"summary": f"{slo} burns"}, status, start,
                 None if status == "firing" else start + 60)


def main() -> int:
    state_dir, url, secret, phase = sys.argv[1:5]
    cfg = AlertingConfig.model_validate({
        "receivers": [{"type": "webhook", "name": "flaky", "url": url, "secret": secret, "timeout": 0.5}],
        "backoff": {"initial": 0.05, "max": 0.3}})
    dispatcher = Dispatcher(cfg, Path(state_dir))
    if phase == "first":
        for change in CHANGES:
            dispatcher.notify(alert(*change))
        print("queued", flush=True)
    else:
        last = {slo: (slo, status, start) for slo, status, start in CHANGES}
        for change in last.values():
            dispatcher.notify(alert(*change))
    dispatcher.start()
    while dispatcher.outbox.depth():
        time.sleep(0.02)
    dispatcher.close()
    print("empty", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
