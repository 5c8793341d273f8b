"""pandastack.cli"""
