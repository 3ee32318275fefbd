"""The tests run in gameopt's debug mode (borrowed and recycled vectors are
poisoned with NaN, see gameopt.debug), subprocesses included."""

import os

import gameopt.debug

os.environ["GAMEOPT_DEBUG"] = "1"
gameopt.debug.set_enabled(True)
