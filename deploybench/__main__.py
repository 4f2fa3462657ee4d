"""``python -m deploybench``: the ``deploybench`` command."""

from deploybench.cli import main

if __name__ == "__main__":  # not when imported (tests walk every module)
    raise SystemExit(main())
