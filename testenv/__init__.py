"""testenv"""
