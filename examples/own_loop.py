"""Your own model, loss and loop on Moment's loader: torchrun --nproc-per-node 2 examples/own_loop.py LAYOUT 2"""
import sys
import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv
import moment


class Net(torch.nn.Module):  # your own 3-layer GraphSAGE, called as PyG's models are: (x, edge_index)
    def __init__(self, dims):
        super().__init__()
        self.convs = torch.nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x, edge_index):
        for conv in self.convs[:-1]:
            x = F.dropout(F.relu(conv(x, edge_index)), p=0.3, training=self.training)
        return self.convs[-1](x, edge_index)


def factory(in_dim, num_classes, num_layers=3, hidden=64):
    return Net([in_dim] + [hidden] * (num_layers - 1) + [num_classes])


def loss(logits, y):
    if y.is_floating_point():  # a multi-label dataset's 0/1 targets [B, C] (run.multilabel)
        return F.binary_cross_entropy_with_logits(logits, y)
    return F.cross_entropy(logits, y, label_smoothing=0.1)


if __name__ == "__main__":
    run = moment.open_run(sys.argv[1], memory_budget="auto", fanouts=[10, 10, 5], batch_size=256)
    model = run.ddp(factory(run.feature_dim, run.num_classes))
    opt = torch.optim.AdamW(model.parameters(), lr=0.003, weight_decay=5e-4)
    for epoch in range(int(sys.argv[2])):
        for batch in run.loader("train", epoch):
            opt.zero_grad()
            step = loss(model(batch.x.float(), batch.edge_index)[: batch.batch_size], batch.y)
            step.backward()
            opt.step()
            run.track(step)
    run.close()  # on every rank; rank 0 prints the run's summary
