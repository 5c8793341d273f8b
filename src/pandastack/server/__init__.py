"""pandastack.server"""
