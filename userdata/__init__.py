"""userdata"""
