"""Streamlit building blocks shared by the pages (the engine in labs/ never imports streamlit)."""
