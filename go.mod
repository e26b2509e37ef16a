module github.com/llmlb/llmlb

go 1.26.8
