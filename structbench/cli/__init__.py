"""The command line: the app (structbench.cli.app) with every command registered, in the order `--help` lists them.
Python imports this package before any of its modules, so importing `structbench.cli.app` registers them all."""

from structbench.cli import app, report, run, tools

app.app.command("list")(tools.list_cmd)
app.app.command()(run.run)
app.app.command()(run.status)
app.app.command()(report.report)
app.app.command("export")(report.export_cmd)
app.app.command()(tools.claims)
app.app.command()(tools.doctor)
app.app.command()(tools.check)
app.app.add_typer(tools.data_app, name="data")
app.app.command()(tools.env)
