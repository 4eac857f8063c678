"""The documented import path of the HTML report (docs/vendors.md): :mod:`conformance.ci.html`."""

from conformance.ci.html import format_html, write_html

__all__ = ["format_html", "write_html"]
