module gymproxy

go 1.24
