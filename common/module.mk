# common/module.mk - programs and tests of common/ (included by the top Makefile)
