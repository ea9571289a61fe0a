# attention/module.mk - programs and tests of attention/ (included by the top Makefile)
