from structbench.cli.app import app

app(prog_name="structbench")
