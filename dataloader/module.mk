# dataloader/module.mk - programs and tests of dataloader/ (included by the top Makefile)
