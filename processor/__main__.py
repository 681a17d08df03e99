# Guarded: a child process of `ductor worker` (process isolation, reruns) imports this module
# again (multiprocessing's spawn) and must not run the command line a second time.
if __name__ == "__main__":
    from processor import early_stop

    early_stop.keep()  # before the modules load: a SIGTERM meanwhile stops the command cleanly
    early_stop.loading_fault()

    from processor.cli.main import main

    raise SystemExit(main())
