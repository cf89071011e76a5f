from structbench.cli import app

app(prog_name="structbench")
