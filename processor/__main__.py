# Guarded: a child process of `ductor worker` (process isolation, reruns) imports this module
# again (multiprocessing's spawn) and must not run the command line a second time.
if __name__ == "__main__":
    from processor.cli import main

    raise SystemExit(main())
