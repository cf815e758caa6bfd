"""bench/peers/flower_app: the demo task as a Flower App (ClientApp and ServerApp)."""
