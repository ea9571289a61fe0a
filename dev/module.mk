# dev/module.mk - programs and tests of dev/ (included by the top Makefile)
