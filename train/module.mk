# train/module.mk - programs and tests of train/ (included by the top Makefile)
