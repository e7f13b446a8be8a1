"""One module per verb; each defines `command`, a click.Command (registered in kit/cli.py)."""
