from tokenviz.cli import run

run()
