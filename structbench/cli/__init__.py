"""The command line: `app` (structbench.cli.app) with every command registered, in the order `--help` lists them.
Python imports this package before any of its modules, so importing `structbench.cli.app` registers them all."""

from structbench.cli import report, run, tools
from structbench.cli.app import app

app.command("list")(tools.list_cmd)
app.command()(run.run)
app.command()(run.status)
app.command()(report.report)
app.command("export")(report.export_cmd)
app.command()(tools.claims)
app.command()(tools.doctor)
app.command()(tools.check)
app.add_typer(tools.data_app, name="data")
app.command()(tools.env)
