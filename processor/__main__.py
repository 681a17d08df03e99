from processor.cli.main import main

# Guarded: a child process of `ductor worker --isolation process` imports this module again
# (multiprocessing's spawn) and must not run the command line a second time.
if __name__ == "__main__":
    raise SystemExit(main())
