# tests/module.mk - programs and tests of tests/ (included by the top Makefile)
