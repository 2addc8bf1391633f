"""The talk "How to Efficiently Send Images to GPU": its generator and what it cuts from the code.

This folder is not part of the installed package: it reads the repository checkout.
"""
