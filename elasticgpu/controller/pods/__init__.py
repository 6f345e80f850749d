"""pods"""
