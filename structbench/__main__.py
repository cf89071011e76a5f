from structbench.cli.app import run_command

run_command()
