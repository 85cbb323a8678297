"""Hopper (sm_90a) GEMM template: see ``sm90_gemm``."""
