"""Transform stage: decoded pixels → training-ready C×H×W arrays (windows, resize, tiles)."""
