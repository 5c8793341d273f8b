"""pandastack.sdk"""
