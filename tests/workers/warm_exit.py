# usage: warm_exit.py HOW -- ends the way HOW says: exit3, raise, message, interrupt or ok.
import sys


def inner():
    raise ValueError("boom")


def outer():
    inner()


how = sys.argv[1]
if how == "exit3":
    sys.exit(3)
if how == "raise":
    outer()
if how == "message":
    sys.exit("bye from the worker")
if how == "interrupt":
    raise KeyboardInterrupt
print("done", __name__)
