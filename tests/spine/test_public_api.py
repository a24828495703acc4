"""The public surface stays small, and importing the package or its CLI does not pull in heavy extras."""

import subprocess
import sys

import sits_observe


def test_package_exports_only_the_version():
    assert sits_observe.__all__ == ["__version__"]
    assert sits_observe.__version__.count(".") == 2


def test_cli_import_does_not_load_torch_dash_or_bcc():
    code = ("import sys, sits_observe.cli, sits_observe.config; sits_observe.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'dash', 'bcc', 'plotly', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
