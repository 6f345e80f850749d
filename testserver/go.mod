module elasticgpu.local/testserver

go 1.22
