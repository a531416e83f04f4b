"""nodeclasses"""
