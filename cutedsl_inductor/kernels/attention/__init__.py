"""FlexAttention forward on Hopper: the kernel (sm90_flex.py) and its template (template.py)."""
